import os

# TensorFlow's C++ start-up notices are noise in test logs.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
