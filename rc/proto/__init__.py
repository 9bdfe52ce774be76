"""The shared language of rc: model records, wire records, codecs, HTTP client.

Standard library only: this package ships in dist/rc.pyz (DESIGN.md §2).
"""
