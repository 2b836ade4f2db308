# Notebooks: execute every notebooks/*.ipynb headlessly (they launch lab 05 themselves); any error fails.
check "notebooks: 01-03 execute without error" python3 notebooks/run_notebooks.py
