"""One module per target format."""
