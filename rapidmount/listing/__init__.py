"""Fast listing: the whole tree under the mount's root, in parallel key ranges."""
