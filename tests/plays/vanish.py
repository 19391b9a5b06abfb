"""Deletes its own sandbox directory, leaves a sleeping child behind, and returns."""

import os
import shutil
import subprocess
import sys


def run(ctx, input):
    marker = input["marker"]
    subprocess.Popen([sys.executable, "-c", f"import time; time.sleep(600)  # {marker}"],
                     start_new_session=True)
    shutil.rmtree(os.getcwd(), ignore_errors=True)
    return {"gone": True}
