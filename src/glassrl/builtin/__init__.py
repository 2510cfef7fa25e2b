"""The bundled models' build recipes: the default model and the tool-using agent."""
