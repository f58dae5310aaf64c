"""Routing one public model name to other configured models: fallback chains and spill-over.

``chain``: the targets of one ``engine = "chain"`` model, their passive health (the pool's
:mod:`adapters.outliers`), the order a request tries them in, and what each failure means.
``saturation``: how full a target is (its queue depth and expected wait), for spill-over.
The scorer (:mod:`gateway.serving.scoring`) computes one attempt on one target; this package
decides which target, and when to move on.
"""
