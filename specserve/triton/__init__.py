"""specserve.triton"""
