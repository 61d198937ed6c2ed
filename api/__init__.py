"""The HTTP service of fusefleet: accepts generation requests, reports their state, serves their images."""
