"""rapidmount: a FUSE mount for Google Cloud Storage Rapid (zonal) buckets."""

__version__ = "0.1.0"
