"""specserve.build"""
