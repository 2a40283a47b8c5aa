"""specserve.runtime"""
