"""What runs behind the gateway: vLLM pool profiles and the vLLM-compatible engine simulator."""
