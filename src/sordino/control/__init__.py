"""control: the admin side (profiling triggers; later hot reconfiguration and chaos)."""
