"""Who leads the cluster and at which term: the `Coordination` interface and its gossip and
NATS backends (backend.py, gossip.py), and the supervised nats-server (natsserver.py;
ADR 0026, 0106)."""
