"""specblock-jax."""
