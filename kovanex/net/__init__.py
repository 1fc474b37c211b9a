"""Gossip shells: wire codec, AES-GCM keyring, transports and the GossipNode."""
