"""Token data: prepare (text -> shards + manifest), shards (the file format), reader (windows)."""
