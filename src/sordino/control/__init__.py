"""control: the admin API (chaos injection today) and its client."""
