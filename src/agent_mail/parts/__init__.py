"""What the operations are built from: value checks, inputs, liveness, notifications, waits, reservation paths."""
