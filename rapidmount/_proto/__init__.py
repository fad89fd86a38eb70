"""Generated protobuf modules (do not edit; run ``make protos``)."""
