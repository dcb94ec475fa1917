"""What the host loop calls between loops: progress lines, TensorBoard, profiling, health."""
