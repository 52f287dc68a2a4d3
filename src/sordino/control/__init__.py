"""control: the admin side: chaos injection (admin API and its client), profiling triggers."""
