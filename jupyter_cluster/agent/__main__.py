"""``python -m jupyter_cluster.agent``: see :mod:`jupyter_cluster.agent._main`."""

from jupyter_cluster.agent._main import main

if __name__ == "__main__":
    main()
