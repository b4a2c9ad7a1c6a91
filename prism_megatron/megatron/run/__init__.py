"""One real process's run: the virtual world, the runtime that applies the patches, measurement and results."""
