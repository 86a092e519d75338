"""The host a window acts on: the site profile, the ports to each service and the adapters behind them."""
