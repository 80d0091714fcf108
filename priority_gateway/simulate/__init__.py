"""Virtual-time experiments: the gateway's own core in front of simulated engines."""
