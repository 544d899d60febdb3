from im_server.cli import main

main()
