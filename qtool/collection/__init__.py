"""Running the model on the inputs and streaming every activation tensor into its statistics."""
