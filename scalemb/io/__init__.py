"""Files in and out, below everything that reads or writes one: the input readers (edge lists in every format,
node ids, the synthetic co-authorship generator) and how any output reaches its place whole (``atomic``: local
directories and files published by one rename, temporaries, locks; ``storage``: object-storage inputs and
outputs; ``markers``: what marks a group as scalemb's).  What scalemb's records hold is ``scalemb.store``'s."""
