"""What any playrun process on a host needs of its neighbours: is a pid alive, a free
port, a child that dies with its parent, a process group stopped for good."""
