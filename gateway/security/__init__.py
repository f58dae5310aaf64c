"""Who may call and how often: API keys, per-key rate limits, the `keys` subcommand."""
