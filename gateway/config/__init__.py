"""Loading the typed config (file, env, defaults) and explaining what a bad value must be."""
