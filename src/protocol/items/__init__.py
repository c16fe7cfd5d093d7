"""Input and output items: the frozen values (``values.py``), reading client and stored JSON
(``read.py``), writing it (``write.py``), images as typed parts (``images.py``), histories
(``history.py``), conversation items, compaction and sealed reasoning."""
