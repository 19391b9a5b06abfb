"""Modal sandboxes through the official SDK: pip install 'playrun[modal]'."""

from tasks.sandbox.providers.modal.provider import ModalProvider

__all__ = ["ModalProvider"]
