"""headrace.persist"""
