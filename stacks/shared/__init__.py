"""What both back ends share: settings, network, storage, the GPU image pipeline, the node bundle, monitoring, constants."""
