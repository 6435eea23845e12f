"""inference_core package."""
