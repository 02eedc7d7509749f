"""Token data: prepare (text -> shards + manifest), shards (the file format), reader (windows); the dataset at
data.url: publish, pull, remote."""
