"""`iris up`: the whole platform on one machine, each service its own process on loopback."""
