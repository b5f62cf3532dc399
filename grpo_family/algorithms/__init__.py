"""Pure tensor maths of every method: imports torch only, never trl or transformers."""
