"""Gossip shells: wire codec, AES-GCM keyring, transports and the embeddable GossipNode."""

from kovanex.net.gossip import GossipNode, MemberInfo
from kovanex.net.keyring import Keyring, keygen

__all__ = ["GossipNode", "Keyring", "MemberInfo", "keygen"]
