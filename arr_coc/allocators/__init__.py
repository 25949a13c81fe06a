"""Alternative allocators behind one interface: variable-size patches, quadtree, learned selector and pruner."""
