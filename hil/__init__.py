"""Hardware-in-the-loop rig: run the same checks on qemu-user, qemu-system or a board over SSH."""
