"""The store and the controller in-process over it, on both engines."""
