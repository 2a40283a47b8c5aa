"""specserve.client"""
