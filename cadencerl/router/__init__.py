"""`cadencerl router`: MISA-T as an OpenAI-compatible router in front of vLLM servers.

The decisions are admission/'s (the simulator runs the same objects); this package only turns live
requests into the controller's events (`live.py`), talks HTTP (`app.py`, `proxy.py`) and watches
the servers (`upstream.py`).
"""
