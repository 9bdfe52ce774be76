"""The worker's parts, in-process or as one child."""
