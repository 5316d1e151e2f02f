"""Plugin hook specifications and loading."""
