"""Worked examples of registering your own tasks; import a module here to register its task."""
