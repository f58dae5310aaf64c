"""Wire formats and typed configuration. Imports only msgspec and the standard library."""
