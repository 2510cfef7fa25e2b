"""What ``glassrl train`` runs: the config and its checks, the build, the loop and its phases."""
