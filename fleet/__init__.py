"""`corral fleet`: replicas of `corral serve` behind one endpoint, as a Ray Serve application.

``affinity`` decides where a request goes (no Ray), ``router`` is the Ray Serve request router
built on it, ``replica`` runs Corral's own app inside a replica, ``ingress`` relays HTTP to the
replicas, and ``app`` assembles and runs the application.
"""
