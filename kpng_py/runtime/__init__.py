"""What every part of a kpng-py process runs on: the event loop and its
thread-safe event, signals, logging with structured fields, retry delays and
timers, and the garbage collector kept out of a change set's way. Imports
nothing else of kpng_py."""
