"""The worker-side part of megamoe.torchrun (sitecustomize.py: see megamoe/torchrun.py)."""
