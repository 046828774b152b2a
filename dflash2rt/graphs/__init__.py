"""Graph capture, backend-agnostic: adapters per vendor API and a bucketed runner."""
