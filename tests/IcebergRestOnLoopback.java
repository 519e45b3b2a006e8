// Apache Iceberg's reference REST catalog, bound to 127.0.0.1 for the tests (tests/iceberg_rest.py starts it with
// `java -cp <jars> tests/IcebergRestOnLoopback.java <port>`, Java's single-file source launch).
//
// What org.apache.iceberg.rest.RESTCatalogServer (iceberg-open-api's test fixtures) serves: iceberg-core's
// RESTCatalogAdapter and RESTCatalogServlet over a backing catalog built from CATALOG_* environment variables
// (CATALOG_URI -> uri, CATALOG_IO__IMPL -> io-impl, CATALOG_S3_ACCESS__KEY__ID -> s3.access-key-id, as its RCKUtils
// reads them), by default a JdbcCatalog. RESTCatalogServer listens on every interface, with no way to choose;
// this listens on loopback only, as every server of the test set-up does. The keys stay in the environment.
import java.net.InetSocketAddress;
import java.util.HashMap;
import java.util.Locale;
import java.util.Map;
import org.apache.iceberg.CatalogUtil;
import org.apache.iceberg.catalog.Catalog;
import org.apache.iceberg.jdbc.JdbcCatalog;
import org.apache.iceberg.rest.RESTCatalogAdapter;
import org.apache.iceberg.rest.RESTCatalogServlet;
import org.eclipse.jetty.server.Server;
import org.eclipse.jetty.servlet.ServletContextHandler;
import org.eclipse.jetty.servlet.ServletHolder;

public class IcebergRestOnLoopback {
  public static void main(String[] args) throws Exception {
    Map<String, String> properties = new HashMap<>();
    System.getenv().forEach((name, value) -> {
      if (name.startsWith("CATALOG_")) {
        String key = name.substring("CATALOG_".length()).replace("__", "-").replace("_", ".");
        properties.put(key.toLowerCase(Locale.ROOT), value);
      }
    });
    properties.putIfAbsent("catalog-impl", JdbcCatalog.class.getName());
    Catalog catalog =
        CatalogUtil.buildIcebergCatalog("rest_backend", properties, new org.apache.hadoop.conf.Configuration());
    ServletContextHandler context = new ServletContextHandler(ServletContextHandler.NO_SESSIONS);
    context.addServlet(new ServletHolder(new RESTCatalogServlet(new RESTCatalogAdapter(catalog))), "/*");
    Server server = new Server(new InetSocketAddress("127.0.0.1", Integer.parseInt(args[0])));
    server.setHandler(context);
    server.start();
    System.out.println("iceberg-rest listening on 127.0.0.1:" + args[0]);
    server.join();
  }
}
