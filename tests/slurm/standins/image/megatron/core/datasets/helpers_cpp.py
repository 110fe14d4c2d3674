"""Stand-in: the compiled dataset helpers (helpers.cpp, built with the image)."""
