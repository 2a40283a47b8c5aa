"""specserve.spec"""
