"""File plumbing the rest of the package shares: durable atomic writes (atomic.py), reading a file a user or
a crafted folder names (regular_file.py), protobuf messages from our own field tables (protobuf.py) and
TensorBoard event files (summary.py)."""
